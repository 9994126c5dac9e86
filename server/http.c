/* placeholder: being written */
typedef int placeholder_http;
