// Fixture of the ladder check: tensor parallelism including the data-parallel folder must be named.
#pragma once

#include "fourway/parallel/dp/layout.hpp"
#include "fourway/parallel/generic.hpp"
