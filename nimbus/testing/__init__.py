"""Test kits for nimbus-ha and its plugins: a conformance suite and fault injection."""
