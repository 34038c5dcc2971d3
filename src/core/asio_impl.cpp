// The one translation unit that compiles Asio and Beast (BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION are set project-wide), so that no other file pays for them.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
