/* What the C API tests share: checks that count failures, a call that must
 * succeed, and deterministic random numbers. */
#ifndef NABLA_TESTS_C_API_CHECK_H
#define NABLA_TESTS_C_API_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla.h"

static int failures = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              nabla_last_error());                                                             \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

/* Stops the test on a failed call: what follows depends on its result. */
#define OK(call)                                                                \
  do {                                                                          \
    nabla_status s_ = (call);                                                   \
    if (s_ != NABLA_OK) {                                                       \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              nabla_status_string(s_), nabla_last_error());                     \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* A failed call with `status` whose message names `name`. */
#define FAILS(call, status, name)                            \
  do {                                                       \
    CHECK((call) == (status));                               \
    CHECK(strstr(nabla_last_error(), (name)) != NULL);       \
    printf("  %-28s %s\n", #status ":", nabla_last_error()); \
  } while (0)

/* Deterministic uniform numbers in [lo, hi). */
static unsigned long long rng_state = 12345;
static float uniform(float lo, float hi) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / (float)0x1000000;
}

/* main's ending: the number of failed checks decides the exit status. */
static int finish(void) {
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}

#endif
