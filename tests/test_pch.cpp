// The translation unit that builds tests/test_pch.h's precompiled header (CMakeLists.txt,
// gantry_test_pch); the test executables reuse it.
