# metrics_test scrapes the endpoint with cpp-httplib's client: it needs the package's feature
# macros (the Client's layout depends on them) and its library.
target_link_libraries(metrics_test PRIVATE PkgConfig::ADAPTCOMM_HTTPLIB)
# prometheus_test runs the demo under the launcher and queries Prometheus with the same client.
target_link_libraries(prometheus_test PRIVATE PkgConfig::ADAPTCOMM_HTTPLIB)
add_dependencies(prometheus_test adaptcomm_cli adaptcomm_trainer)
# status_test drives `adaptcomm status` against the demo under the launcher.
add_dependencies(status_test adaptcomm_cli adaptcomm_trainer)
