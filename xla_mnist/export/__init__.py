"""XLA's ahead-of-time export: the C++ classifier and its build."""
