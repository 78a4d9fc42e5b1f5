"""The commands of `openstack gpu` (API version 1)."""
