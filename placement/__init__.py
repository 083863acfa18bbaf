"""gpufed placement package."""
