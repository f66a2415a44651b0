"""Reading what exists: the registry file, the known catalog, autodiscovery, and the catalog
state that folds runtime facts into descriptors."""
