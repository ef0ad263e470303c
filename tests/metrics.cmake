# metrics_test scrapes the endpoint with cpp-httplib's client: it needs the package's feature
# macros (the Client's layout depends on them) and its library.
target_link_libraries(metrics_test PRIVATE PkgConfig::ADAPTCOMM_HTTPLIB)
