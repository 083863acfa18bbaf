"""gpufed clusters package."""
