// The code version (git describe at configure time), stored in checkpoints and printed in logs.
#pragma once

namespace gantry {
const char* code_version();
}
