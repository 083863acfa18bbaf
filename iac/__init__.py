"""gpufed iac package."""
