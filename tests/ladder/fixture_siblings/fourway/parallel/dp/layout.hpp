// Fixture of the ladder check: a policy folder includes the generic parallel/ headers and its own.
#pragma once

#include "fourway/parallel/generic.hpp"
