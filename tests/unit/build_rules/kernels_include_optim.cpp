// Forbidden: kernels own the element math and do not depend on the optimizer.
#include "optim/adamw.h"
