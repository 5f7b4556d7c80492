//! onejob: one user intent, exactly one durable Job, however often it is
//! clicked, retried or failed over. See ARCHITECTURE.md for the layers.

pub mod callbacks;
pub mod cli;
pub mod config;
pub mod domain;
pub mod providers;
pub mod qualify;
pub mod startup;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod web;
pub mod worker;
