"""GSaaS's panels for Horizon."""
