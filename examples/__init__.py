"""Example configuration, schemas and a custom policy for kvproxy."""
