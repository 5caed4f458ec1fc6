/*
 * The verbs observer's lookup scope: a library with no code whose dependencies are the
 * observer, libibverbs and librdmacm, in that order. The observer answers a program's
 * dlopen("libibverbs.so.1") (or librdmacm) with this library's handle, so a dlsym on it finds
 * the observer's wrappers first and the real libraries for everything else.
 */
int wringer_verbs_scope;
