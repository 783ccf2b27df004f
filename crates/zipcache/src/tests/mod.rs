//! The engine's tests across its modules: the engine against a model (`model`), every way
//! it could serve a deleted or overwritten value (`never_stale`), power cuts at any point
//! (`power_loss`), the DRAM budget (`capacity`), GETs with their reads in flight
//! (`async_read`), what the crash journal marks (`marks`) and a collection's header kept
//! on every tier (`collection`).

mod async_read;
mod capacity;
mod collection;
mod marks;
mod model;
mod never_stale;
mod power_loss;
