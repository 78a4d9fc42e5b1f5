"""The python-openstackclient plugin of GSaaS: `openstack gpu ...`."""
