"""gpufed federation package."""
