// Include once in a program that joins a job through PMIx and is tested under AddressSanitizer:
// Debian's libpmix 4.2.2 leaks a few bytes it strdup()s while PMIx_Init sets itself up (in
// pmix_rte_init and pmix_bfrops_base_value_load; PMIx_Finalize does not free them), which
// LeakSanitizer would report at every exit. This tells LeakSanitizer to ignore those two, and
// nothing else. Without the sanitizer the function is never called.
#pragma once

/// LeakSanitizer's default suppressions (its documented hook).
extern "C" const char* __lsan_default_suppressions() {
  return "leak:pmix_rte_init\nleak:pmix_bfrops_base_value_load\n";
}
