// HTTP status codes' reason phrases (RFC 9110 §15), shared by the server's error bodies and the client's
// error messages.
#pragma once

namespace gantry {

// "Not Found" for 404; "Error" for a code not listed.
const char* http_reason_phrase(int status);

}  // namespace gantry
