"""The host: lifecycle over the registry, its pools and services, and the views of its state."""
