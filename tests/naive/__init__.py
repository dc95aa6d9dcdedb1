"""The naive patterns Agent Jobs replaces, kept only so tests can show that each pitfall breaks them."""
