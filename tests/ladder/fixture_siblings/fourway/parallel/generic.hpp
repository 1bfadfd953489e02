// Fixture of the ladder check: a generic header of the parallel rung, usable by every policy.
#pragma once
