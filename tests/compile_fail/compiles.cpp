// Compiles in both modes: the harness must report a failure for it.
#include "fourway/config.hpp"

int main() { return fourway::dynamic < 0 ? 0 : 1; }
