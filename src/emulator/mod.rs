//! ARM emulator.
