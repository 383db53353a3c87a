// Allowed (the control): the model calls kernels through the dispatch.
#include "kernels/dispatch.h"
