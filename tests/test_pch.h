// The precompiled header of every test executable (CMakeLists.txt, GANTRY_TEST_PCH): what most tests
// include and every test would otherwise parse again. Only outside headers: a project header here would
// rebuild every test when it changes.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
