// Forbidden: the model never calls a collective, so it cannot see comm/ (tests/unit/build_rules).
#include "comm/comm.h"
