//! gsaasd's integration tests, one binary: every test links all of gsaasd, so one binary links it
//! once instead of once per file. Each module is one area (a file of `api/tests/`); run one area
//! with `cargo test -p gsaasd --test integration queue::`. Shared helpers come from the
//! `gsaas-test-support` crate.

use gsaas_test_support as support;
use gsaas_test_support::on_both_stores;

mod api;
mod attacks;
mod background_tasks;
mod cloudinit;
mod cohort_faults;
mod cohorts;
mod compute_shares;
mod conformance;
mod dashboard;
mod db;
mod drift;
mod elastic;
mod failures;
mod fleet;
mod hosts;
mod keystone_auth;
mod lists;
mod local_vms;
mod metrics;
mod notifications;
mod openapi;
mod openstack;
mod openstack_contract;
mod operability;
mod policy;
mod queue;
mod quotas;
mod remoting;
mod replicas;
mod saga;
mod servers;
mod sim_cloud;
mod usage;
