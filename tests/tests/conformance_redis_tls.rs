//! The conformance suite on a TLS-only Redis server with an ACL user and password.

use dlock_tests::fixtures::redis::RedisFixture;

dlock_tests::conformance_suite!(RedisFixture::tls_with_acl_user());
