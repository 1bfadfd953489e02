// A checkpoint header that knows slices and runs only: nothing for the check to name.
#pragma once
#include "fourway/layers/placement.hpp"
