// ingressd: an ingress proxy for Ray Serve LLM serving. Everything lives in ingressd_core;
// this file only hands the command line over.
#include "ingressd/app/runner.hpp"

int main(int argc, char** argv) { return ingressd::server::run(argc, argv); }
