//! Sending the next batch when a slot is given back, one batch after
//! another on the thread, never one inside another.
//!
//! Why: giving a slot back sends the next queued batch from a task of its
//! own, and that task owns the next slot. On a runtime that is shutting
//! down (a test or a `main` that panicked holding 50,000 guards, whose
//! releases were queued there), `spawn` drops the task at once, inside the
//! call: its slot is given back, which sends the next batch, whose task is
//! dropped in turn... one level of stack per batch of 8, 6,250 for 50,000
//! queued releases, which overflowed a tokio worker's stack and aborted
//! the process. Here a batch sent while another is being sent on the same
//! thread waits in a per-thread list until the outer send returns: the
//! depth is two calls, whatever the queue's length.

use std::cell::RefCell;
use std::collections::VecDeque;

/// Sends one batch (with the slot it goes out in).
pub(super) type SendBatch = Box<dyn FnOnce()>;

thread_local! {
    /// `Some` while this thread sends a batch: the ones handed over
    /// meanwhile, sent in order once it returns.
    static HANDED_OVER: RefCell<Option<VecDeque<SendBatch>>> = const { RefCell::new(None) };
}

/// Runs `send` now, or, if this thread is already sending a batch (this is
/// a slot given back inside that send), right after it.
pub(super) fn hand_over(send: SendBatch) {
    let mut send = Some(send);
    // During the thread's own teardown there is no list: `send` stays here
    // and runs in place, nested as it comes (only a runtime dropped by a
    // thread-local's destructor gets there).
    let _ = HANDED_OVER.try_with(|handed| {
        let mut handed = handed.borrow_mut();
        match handed.as_mut() {
            Some(later) => later.extend(send.take()),
            None => *handed = Some(VecDeque::new()),
        }
    });
    let Some(mut next) = send else {
        return;
    };
    let _sending = SendingHere;
    loop {
        next();
        let later = HANDED_OVER
            .try_with(|handed| handed.borrow_mut().as_mut().and_then(VecDeque::pop_front));
        match later.ok().flatten() {
            Some(send) => next = send,
            None => return,
        }
    }
}

/// Ends this thread's sending, also when a send panics: the batches still
/// handed over are dropped (each gives its slot back, which starts a
/// sending of its own), after the list is taken out of the thread-local.
struct SendingHere;

impl Drop for SendingHere {
    fn drop(&mut self) {
        let left = HANDED_OVER.try_with(|handed| handed.borrow_mut().take());
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A send that hands over the next one from inside itself, `left` more
    /// times: what a runtime that drops each spawned batch at once does.
    fn chain(left: usize, order: Arc<std::sync::Mutex<Vec<usize>>>, depth: Arc<AtomicUsize>) {
        hand_over(Box::new(move || {
            let now = depth.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(now <= 1, "a send ran inside another: depth {now}");
            order.lock().unwrap().push(left);
            if left > 0 {
                chain(left - 1, order.clone(), depth.clone());
            }
            depth.fetch_sub(1, Ordering::SeqCst);
        }));
    }

    #[test]
    fn nested_hand_overs_run_one_after_another_not_inside() {
        // 1,000,000 levels would overflow any thread's stack if nested.
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        chain(1_000_000, order.clone(), Arc::new(AtomicUsize::new(0)));
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 1_000_001);
        assert!(order.windows(2).all(|w| w[0] == w[1] + 1), "in order");
        HANDED_OVER.with(|h| assert!(h.borrow().is_none(), "the sending ended"));
    }

    #[test]
    fn a_panicking_send_ends_the_sending_and_drops_what_waited() {
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let waiting = Counted(dropped.clone());
        let counted = ran.clone();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hand_over(Box::new(move || {
                hand_over(Box::new(move || {
                    let _waiting = waiting;
                    counted.fetch_add(1, Ordering::SeqCst);
                }));
                panic!("a send panics");
            }));
        }));
        assert!(panicked.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 0, "not run after the panic");
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "dropped unrun");
        HANDED_OVER.with(|h| assert!(h.borrow().is_none(), "the sending ended"));
        let ran = Arc::new(AtomicUsize::new(0));
        let counted = ran.clone();
        hand_over(Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the next send runs");
    }
}
