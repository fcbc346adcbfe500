// The one way a test makes a scratch directory. ctest runs every test case in a process of its own, in
// parallel and in random order (scripts/test.sh), so a path must be unique to the process and say whose it
// is: <TempDir>/gantry_<suite>_<test>_<what>_<pid>. A parameterised case's name carries its parameter
// index, so two cases of one test never share a directory either. tests/source_rules_test.cpp checks
// that no other file under tests/ builds scratch paths of its own.
//
//   const std::filesystem::path dir = testing_support::scratch_dir("ckpt");  // empty, created
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <filesystem>
#include <string>
#include <string_view>

namespace gantry::testing_support {

// The path alone (nothing created or removed), for callers that name files rather than folders.
inline std::filesystem::path scratch_path(std::string_view what) {
  std::string name = "gantry";
  if (const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name += std::string("_") + t->test_suite_name() + "_" + t->name();
  }
  if (!what.empty()) name += "_" + std::string(what);
  name += "_" + std::to_string(::getpid());
  for (char& c : name) {
    if (c == '/') c = '_';  // parameterised suites are named "Prefix/Suite"
  }
  return std::filesystem::path(::testing::TempDir()) / name;
}

// A fresh, empty directory: whatever an earlier run of the same process id left there is removed.
inline std::filesystem::path scratch_dir(std::string_view what = "") {
  const std::filesystem::path p = scratch_path(what);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace gantry::testing_support
