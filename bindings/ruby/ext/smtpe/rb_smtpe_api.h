/* rb_smtpe_api.h - how the extension sees the engine's API: hidden, so only Init_smtpe leaves
 * the shared object. Included before smtpe.h by every file of the extension. */
#ifndef RB_SMTPE_API_H
#define RB_SMTPE_API_H
#define SMTPE_API __attribute__((visibility("hidden")))
#include "smtpe.h"
#endif
