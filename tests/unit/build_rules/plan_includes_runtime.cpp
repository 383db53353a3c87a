// Forbidden: lib/ (the control plane) never reaches runtime/.
#include "core/allocator.h"
