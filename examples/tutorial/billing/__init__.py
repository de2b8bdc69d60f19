"""The billing team's handler service (docs/tutorial/own-context.md)."""
