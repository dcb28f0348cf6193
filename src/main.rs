//! Entry point: everything is in [`vmss_capacity_controller::cli::main`], so this binary compiles
//! in seconds (the library holds every instantiation).

fn main() -> std::process::ExitCode {
    vmss_capacity_controller::cli::main()
}
