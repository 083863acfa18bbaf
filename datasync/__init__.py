"""gpufed datasync package."""
