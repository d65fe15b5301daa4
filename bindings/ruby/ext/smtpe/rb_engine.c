/* rb_engine.c - the engine, compiled into the extension from the amalgamation (vendor/smtpe.c,
 * written by bindings/ruby/vendor.sh). SMTPE_API is made hidden so that no engine function is
 * exported from smtpe.so (its internal functions are static already). */
#include "rb_smtpe_api.h"
#include "smtpe.c"
