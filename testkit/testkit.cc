// Placeholder until the testkit lands.
