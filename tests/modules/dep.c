/* A library a fake module needs, kept where the loader does not look (test_modules). */
int ccq_test_dep(void);
int ccq_test_dep(void)
{
    return 0;
}
