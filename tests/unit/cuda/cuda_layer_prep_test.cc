// Placeholder: filled in with issue 6.
#include <gtest/gtest.h>

TEST(Placeholder, cudalayerpreptest) { GTEST_SKIP() << "not written yet"; }
