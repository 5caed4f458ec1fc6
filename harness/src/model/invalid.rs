//! Input that does not say what it must. Every check returns [`Invalid`], whose message says
//! what to fix; loading a file turns it into a located error (file, line and column).

/// A check's refusal: what is wrong, and what to write instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<String> for Invalid {
    fn from(why: String) -> Self {
        Invalid(why)
    }
}

impl From<&str> for Invalid {
    fn from(why: &str) -> Self {
        Invalid(why.to_string())
    }
}

impl From<Invalid> for String {
    fn from(i: Invalid) -> Self {
        i.0
    }
}

/// The message, for the tests and reporters that read it.
impl std::ops::Deref for Invalid {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}
