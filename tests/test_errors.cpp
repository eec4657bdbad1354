#include <doctest/doctest.h>
#include "tapestry.h"
