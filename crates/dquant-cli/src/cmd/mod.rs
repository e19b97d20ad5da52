pub mod bench;
pub mod convert;
pub mod corpus;
pub mod demo;
pub mod inspect;
pub mod read;
pub mod verify;
