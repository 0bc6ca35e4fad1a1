//! What a push has shown of its build's output, so a failure's last lines are not shown twice.

/// How a failure's message names the output it ends with (the agent's build and release
/// errors, see `warden-agent`'s `build/`).
const LAST_LINES: &str = "; last lines:\n";

/// The lines of a release's output shown to the pusher, the latest [`Shown::KEEP`] of them.
#[derive(Default)]
pub(crate) struct Shown(std::collections::VecDeque<String>);

impl Shown {
    const KEEP: usize = 400;

    pub(crate) fn push(&mut self, log: &str) {
        for line in log.lines() {
            if self.0.len() == Self::KEEP {
                self.0.pop_front();
            }
            self.0.push_back(line.to_owned());
        }
    }

    /// `error` without its "last lines" when the pusher saw every one of them just above,
    /// in that order at the end of the output; with them otherwise (a failure whose output
    /// was not streamed, such as a trial's instance).
    pub(crate) fn without_repeated_tail<'a>(&self, error: &'a str) -> std::borrow::Cow<'a, str> {
        let Some((head, tail)) = error.split_once(LAST_LINES) else {
            return error.into();
        };
        let tail: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
        let seen: Vec<&str> = self
            .0
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim().is_empty())
            .collect();
        if tail.is_empty() || !seen.ends_with(&tail) {
            return error.into();
        }
        format!("{head} (its last lines are above)").into()
    }
}

#[cfg(test)]
mod tests {
    use super::Shown;

    #[test]
    fn a_tail_already_shown_is_not_repeated_and_one_not_shown_is() {
        let mut shown = Shown::default();
        shown.push("-----> building\nstep 1\nERROR: no such package");
        let error =
            "the build failed (exit status: 1); last lines:\nstep 1\nERROR: no such package";
        assert_eq!(
            shown.without_repeated_tail(error),
            "the build failed (exit status: 1) (its last lines are above)"
        );
        // Lines the pusher did not see (a trial's instance's output) stay.
        let trial = "the release's instance exited; last lines:\nboom";
        assert_eq!(shown.without_repeated_tail(trial), trial);
        // Shown, but not as the end of the output: stays, so nothing is hidden.
        shown.push("later line");
        assert_eq!(shown.without_repeated_tail(error), error);
        assert_eq!(shown.without_repeated_tail("plain"), "plain");
    }
}
