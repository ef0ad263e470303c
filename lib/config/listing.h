// EffectiveConfig::CanonicalListing() read back ("key=value" per line), for messages that name
// the settings two ranks disagree on (the cross-rank config check, elastic admission).
#ifndef ADAPTCOMM_LIB_CONFIG_LISTING_H_
#define ADAPTCOMM_LIB_CONFIG_LISTING_H_

#include <map>
#include <string>

namespace adaptcomm::config {

std::map<std::string, std::string> ParseCanonicalListing(const std::string& listing);

}  // namespace adaptcomm::config

#endif  // ADAPTCOMM_LIB_CONFIG_LISTING_H_
