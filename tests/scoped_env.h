// An environment variable set for the life of a scope, then removed (tests that read the
// launcher's or adaptcomm's variables). Not thread-safe, as setenv is not: set it before ranks
// start.
#ifndef ADAPTCOMM_TESTS_SCOPED_ENV_H_
#define ADAPTCOMM_TESTS_SCOPED_ENV_H_

#include <stdlib.h>

#include <string>

namespace adaptcomm::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_SCOPED_ENV_H_
