//! Runs the leader example on `memory://` as a user would: two candidates
//! take 6 terms between them, each term greater than the one before, and
//! the observer sees every leader and every resignation.

use std::time::Duration;

mod example_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_take_turns_with_increasing_terms() {
    let run = tokio::process::Command::new(example_binary::path("leader", &[]))
        .env("DLOCK_URL", "memory://")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the example ended within 60 s")
        .expect("the example ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let terms: Vec<u64> = stdout
        .lines()
        .filter_map(|line| {
            line.split_once(": elected, term ")?
                .1
                .split(';')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(terms.len(), 6, "{stdout}");
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{stdout}");
    for term in &terms {
        assert!(
            stdout.contains(&format!(":8080 (term {term}) leads"))
                && stdout.contains(&format!(":9090 (term {term}) leads")),
            "the observer missed a value of term {term}:\n{stdout}"
        );
    }
    assert!(stdout.contains("observer: nobody leads"), "{stdout}");
}
