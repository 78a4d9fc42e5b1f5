//! The clouds gsaasd drives, apart from gsaasd so that nothing of its application or datastore
//! reaches them, and they reach neither: [`cloud`] is the one `Cloud` trait the application
//! calls, with OpenStack's implementation (`cloud::nova`: Nova, Glance and Neutron) and the
//! simulated cloud of the embedded default (`cloud::sim`); [`openstack`] talks to Keystone (the
//! service's token, tenants' tokens validated, trusts, users' sign-in).

pub mod cloud;
pub mod openstack;
