//! dlock's Redisson layout against node-redisson (a Node process, the
//! layout of Java Redisson's `RLock`), both ways, on one Redis server and on
//! a Redis Cluster of three masters; and against dlock's own layout on the
//! same names (`layout_mix`), there and behind Sentinel.

// The layout-mix cases nest dlock's acquire of both layouts in one future:
// clippy's const evaluation of its layout goes past the default query depth.
#![recursion_limit = "256"]

use dlock_tests::fixtures::redisson::RedissonFixture;
use dlock_tests::fixtures::sentinel::SentinelFixture;
use dlock_tests::layout_mix::{self as mix, Layouts};
use dlock_tests::redisson_cases as cases;

/// The layout-mix cases (`dlock_tests::layout_mix`) on one fixture.
macro_rules! layout_mix_tests {
    ($fixture:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn each_layout_keeps_the_other_out() {
            let f = &$fixture;
            let layouts = Layouts::connect(f.plain_url(), f.is_cluster()).await;
            Box::pin(mix::each_layout_keeps_the_other_out(&layouts)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_waiter_is_served_after_the_other_layouts_release() {
            let f = &$fixture;
            let layouts = Layouts::connect(f.plain_url(), f.is_cluster()).await;
            Box::pin(mix::a_waiter_is_served_after_the_other_layouts_release(
                &layouts,
            ))
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn no_two_holders_across_layouts() {
            let f = &$fixture;
            Box::pin(mix::no_two_holders_across_layouts(
                f.plain_url(),
                f.is_cluster(),
            ))
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_application_key_of_the_same_name_does_not_block() {
            let f = &$fixture;
            let layouts = Layouts::connect(f.plain_url(), f.is_cluster()).await;
            let cli = |args: &[&str]| f.redis_cli(args);
            Box::pin(mix::an_application_key_of_the_same_name_does_not_block(
                &layouts, cli,
            ))
            .await;
        }
    };
}

// Each case is awaited boxed: inlined into the test's own future, the
// nesting of a case (dlock's acquire, the Node process's lines) takes
// rustc past its query depth limit when it lays the future out.

mod single {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_keeps_the_other_out() {
        let f = &RedissonFixture::single();
        Box::pin(cases::each_keeps_the_other_out(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn node_release_wakes_a_dlock_waiter() {
        let f = &RedissonFixture::single();
        Box::pin(cases::node_release_wakes_a_dlock_waiter(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dlock_release_wakes_a_node_waiter() {
        let f = &RedissonFixture::single();
        Box::pin(cases::dlock_release_wakes_a_node_waiter(f, false)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_dlock_guard_hands_over_to_node() {
        let f = &RedissonFixture::single();
        Box::pin(cases::dlock_release_wakes_a_node_waiter(f, true)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_renewals_outlast_their_ttls() {
        let f = &RedissonFixture::single();
        Box::pin(cases::both_renewals_outlast_their_ttls(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_node_holder_frees_at_its_lease() {
        let f = &RedissonFixture::single();
        Box::pin(cases::a_killed_node_holder_frees_at_its_lease(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inner_braces_wake_both_ways() {
        let f = &RedissonFixture::single();
        Box::pin(cases::inner_braces_wake_both_ways(f)).await;
    }

    layout_mix_tests!(RedissonFixture::single());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel() {
    let f = SentinelFixture::start();
    Box::pin(cases::through_sentinel(f.url(), |args| f.redis_cli(args))).await;
}

/// One name, one lock behind Sentinel: the two layouts on the master
/// exclude each other and hand over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layouts_exclude_each_other_through_sentinel() {
    let f = SentinelFixture::start();
    let layouts = Layouts::connect(f.url(), false).await;
    Box::pin(mix::each_layout_keeps_the_other_out(&layouts)).await;
    Box::pin(mix::a_waiter_is_served_after_the_other_layouts_release(
        &layouts,
    ))
    .await;
}

mod cluster {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_keeps_the_other_out() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::each_keeps_the_other_out(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn node_release_wakes_a_dlock_waiter() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::node_release_wakes_a_dlock_waiter(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dlock_release_wakes_a_node_waiter() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::dlock_release_wakes_a_node_waiter(f, false)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_dlock_guard_hands_over_to_node() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::dlock_release_wakes_a_node_waiter(f, true)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_renewals_outlast_their_ttls() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::both_renewals_outlast_their_ttls(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_node_holder_frees_at_its_lease() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::a_killed_node_holder_frees_at_its_lease(f)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sharded_release_wakes_a_dlock_waiter() {
        let f = &RedissonFixture::cluster();
        Box::pin(cases::a_sharded_release_wakes_a_dlock_waiter(f)).await;
    }

    layout_mix_tests!(RedissonFixture::cluster());
}
