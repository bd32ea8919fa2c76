// What the trainer's C++ shims share: C++ exceptions become messages that
// cross the C interface in *err (malloc'd, freed with
// offgnn_shim_free_string, in torch_shim.cpp).

#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace offgnn {

inline char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.c_str(), s.size() + 1);
  }
  return out;
}

// Runs f, turning an exception into a message in *err; returns whether f
// completed.
template <typename F>
inline bool guarded(char** err, F&& f) {
  try {
    f();
    return true;
  } catch (const c10::Error& e) {
    *err = copy_string(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *err = copy_string(e.what());
  } catch (...) {
    *err = copy_string("unknown C++ exception");
  }
  return false;
}

}  // namespace offgnn
