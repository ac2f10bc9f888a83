//! The launcher (`mrcache`): what it says of bad values, its manual pages and completions,
//! and where it finds the library once installed.

mod bad_values;
mod install_paths;
mod manual_pages;
