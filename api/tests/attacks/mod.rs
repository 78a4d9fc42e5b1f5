//! The standing attacker suite: each module is one kind of attacker, each test one threat, tried
//! as that attacker would (a hostile tenant or agent as a small client or server in the test, a
//! forged or replayed token, a flood). docs/security.md names the test that proves each threat
//! is held; a new feature adds its threat here.

mod hostile_agents;
mod hostile_tenants;
mod neighbours;
mod onlookers;
mod policy_files;
mod slow_clients;
mod tokens;
